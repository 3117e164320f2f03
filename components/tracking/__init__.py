"""MLflow and DVC helpers: records of what ran on which bytes, and how to reproduce it."""
