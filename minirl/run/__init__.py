"""The harness around the training steps: `train(cfg)` for SFT (sft.py) and GRPO (grpo.py)."""
