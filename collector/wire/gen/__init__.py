"""Generated from proto/toolwitness/v1 by scripts/gen_proto.py. Do not edit."""
