"""Redis key names shared by the stages, so a reader of one stage's output knows where to look."""


def pages_key(record_id: str) -> str:
    """Router -> Parser: the document's pages with their text and categories."""
    return f"pages:{record_id}"


def parsed_key(record_id: str) -> str:
    """Parser -> Grouper (and readers): the findings extracted from the document."""
    return f"parsed:{record_id}"


def grouped_key(record_id: str) -> str:
    """Grouper -> readers: biomarkers grouped under canonical names."""
    return f"grouped:{record_id}"
