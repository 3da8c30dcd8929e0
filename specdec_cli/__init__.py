"""specdec: lossless speculative decoding over llama.cpp GGUF models."""

__version__ = "0.1.0"
