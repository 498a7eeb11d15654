"""toolwitness streaming service: receivers → processors → exporters, like an OpenTelemetry Collector."""
