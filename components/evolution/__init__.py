"""The evolution round: diagnose, plan, patch, validate, gate, commit. Plain functions; flows/ composes them."""
