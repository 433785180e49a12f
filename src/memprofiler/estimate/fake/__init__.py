"""What fake tensors need to step as real ones do: strides, dtypes, real values, tied weights."""
