"""The demo model of issue 5: procedural training data, pixel metrics (and, later, training)."""
