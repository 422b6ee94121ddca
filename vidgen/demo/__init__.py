"""The demo model: procedural training data, pixel metrics, training and evaluation (docs/demo.md)."""
