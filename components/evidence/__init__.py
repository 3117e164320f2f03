"""Campaign memory: evidence packets with checked citations, the evidence graph, the budget ledger."""
