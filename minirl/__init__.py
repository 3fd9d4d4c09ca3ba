"""minirl: Agentic RL for Qwen2.5, from scratch in PyTorch. See README.md."""

from .config import Qwen2Config, preset
from .model import Qwen2, random_model
from .sampling import Completion, generate, stream
from .tokenizer import Tokenizer
from .weights import load_model, load_pretrained, save_pretrained

__version__ = "0.1.0"
__all__ = [
    "Qwen2Config",
    "preset",
    "Qwen2",
    "random_model",
    "Completion",
    "generate",
    "stream",
    "Tokenizer",
    "load_model",
    "load_pretrained",
    "save_pretrained",
]
