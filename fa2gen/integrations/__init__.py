"""fa2gen behind other libraries' interfaces: flash-attention's functions (``flash_attn``)."""
