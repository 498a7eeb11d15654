"""Wire formats: generated protobuf modules (gen/) and their conversions to scoring models."""
