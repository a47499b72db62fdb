"""Redis key names shared by the stages, so a reader of one stage's output knows where to look.

A key one stage writes for the next (pages, parsed) has no expiry of its own: it lives as long as the record is
unfinished, so no stage outage, however long, can make a record unrecoverable. The stage that consumes it
deletes it (pages) or gives it its lifetime then (parsed expires with grouped, GROUPED_TTL after grouping).
"""


def pages_key(record_id: str) -> str:
    """Router -> Parser: the document's pages with their text and categories."""
    return f"pages:{record_id}"


def parsed_key(record_id: str) -> str:
    """Parser -> Grouper (and readers): the findings extracted from the document."""
    return f"parsed:{record_id}"


def grouped_key(record_id: str) -> str:
    """Grouper -> readers: biomarkers grouped under canonical names."""
    return f"grouped:{record_id}"
