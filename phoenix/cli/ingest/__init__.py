"""`phoenix ingest`: records into a pipeline's first stage over HTTP, once per record id, refused while its input
is over the high water; a record's trace back (docs/pipelines.md, "HTTP ingest")."""
