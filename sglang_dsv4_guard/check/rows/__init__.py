"""``check``'s prefill/decode contract rows (``contract``: the table and its run), each a
comparison SGLang makes between the two servers at start-up, first contact or per request,
and the prefill/decode asymmetries no run-time check sees (``asymmetry``).
"""
