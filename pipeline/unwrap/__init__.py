"""Stage 4, uv: the UV unwrap (charts, LSCM, packing) and its measures."""
