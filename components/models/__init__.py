"""Model backends behind one chat interface: the embedded simulated agent and an OpenAI-compatible client."""
