"""Feature-based federated transfer learning (paper 003): pure math that supports the FbFTL scheme.

``leakage`` holds the paper's entropy analysis of label leakage for the shuffled (features, label) upload.
"""
