"""vitdeploy: a PyTorch Vision Transformer to a validated ONNX model, an FP16 TensorRT engine and
one runtime that serves every backend with the same preprocessing."""

__version__ = "0.1.0"
