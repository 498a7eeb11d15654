"""toolwitness scoring library: pure, three-valued, trace-backed scoring (no network imports)."""
