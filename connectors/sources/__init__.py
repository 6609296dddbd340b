"""Document sources: Parquet, Arrow IPC, JSON Lines and CSV, normalised to id/text/time batches."""

from connectors.sources.base import SourceError
from connectors.sources.files import FORMATS, Source, open_source

__all__ = ["FORMATS", "Source", "SourceError", "open_source"]
