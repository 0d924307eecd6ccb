"""One server of the pair, derived from its launch line with the installed release's code:
the model and layout (``derive``), the line's typed flags and edits to it (``edit``), SGLang's
own word on a value it chose (``said``), miniature real pools (``pools``) and the state they
register (``state_types``, ``swa_layout``), the page size per GPU model (``gpus``), and the
server as the PD contract's endpoint (``endpoint_values``).
"""
