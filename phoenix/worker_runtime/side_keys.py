"""Names of the keys a worker writes for others to read (the operator, `phoenix status`), spelled once."""


def backpressure_key(stage: str) -> str:
    """While set: the stage is paused by backpressure; the value is its output's unfinished entries, as measured."""
    return f"phoenix:{stage}:backpressure"


def dlq_trimmed_key(dlq: str) -> str:
    """Counter of the entries DLQ_MAXLEN has removed from the dead-letter stream `dlq`, ever."""
    return f"{dlq}:trimmed"
