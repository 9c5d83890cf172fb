"""fedrun: an experiment runner for private and communication-efficient federated learning."""

__version__ = "0.1.0"
