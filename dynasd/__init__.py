"""DynaSD Explorer engine: multi-candidate speculative decoding, step by step, with traces."""
