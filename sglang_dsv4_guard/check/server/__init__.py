"""One server of the pair, derived from its launch line with the installed release's code,
and as the PD contract's endpoint (each module says what it holds; the map is in
docs/contributing.md)."""
