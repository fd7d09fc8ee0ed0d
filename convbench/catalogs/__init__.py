"""Where problems come from: the networks' layers, DeepBench, ConvBench's catalog, problem files."""
