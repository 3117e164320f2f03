"""The invariant turn kernel, the port it talks through, receipts and grounding, traces."""
