"""Phoenix: reliable, autoscaled pipeline stages on Redis Streams."""

__version__ = "0.1.0"
