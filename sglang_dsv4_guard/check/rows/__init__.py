"""``check``'s prefill/decode contract rows (``contract``: the table and its run, which
also runs the pair conditions of ``pd/conditions.py``), each a comparison SGLang makes
between the two servers at start-up, first contact or per request.
"""
