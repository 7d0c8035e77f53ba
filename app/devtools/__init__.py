"""Test equipment shared by the demo, the tests and the chaos soak: never imported by the product."""
