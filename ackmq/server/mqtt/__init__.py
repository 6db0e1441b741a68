"""MQTT 3.1, 3.1.1 and 5.0 (SPEC N): docs/mqtt.md."""
