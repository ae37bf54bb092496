"""sparkctl: from a rack of DGX Spark boxes and a checkpoint to a healthy, benchmarked endpoint."""

__version__ = "0.1.0"
