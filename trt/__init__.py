"""Engines: ONNX export, TensorRT and AOTInductor backends, engine sets. TensorRT is imported lazily."""
