"""billing: streaming usage and billing accounting for LLM API gateways."""

__version__ = "0.1.0"
