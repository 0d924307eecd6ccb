"""What the guard knows of the imported SGLang: its release profiles, its code digests,
the judgement of which release it is, its hook registry and our patch series in it."""
