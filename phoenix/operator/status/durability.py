"""Pure status logic for what can hold records back or lose them: the Backpressure, RedisRisk, OutputUnread and
QueueFiguresDisagree conditions."""

from __future__ import annotations

from collections.abc import Sequence

from phoenix.crds import Condition, ConditionType
from phoenix.operator.status.conditions import new_condition
from phoenix.worker_runtime.redis_risk import RedisRisk


def backpressure_condition(unfinished: int | None, generation: int | None = None) -> Condition:
    """True while a worker of the stage reports it stopped reading (`unfinished`: its output's unfinished entries)."""
    if unfinished is None:
        return new_condition(
            ConditionType.BACKPRESSURE,
            False,
            "OutputBelowHighWater",
            "the stage reads its input",
            observed_generation=generation,
        )
    message = (
        f"the output holds {unfinished} unfinished entries, over OUTPUT_HIGH_WATER (for a stage of K partitions "
        "forwarding to K, over a partition's share of it): the stage, or that partition, stopped reading its input "
        "until the next stage catches up"
    )
    return new_condition(
        ConditionType.BACKPRESSURE, True, "OutputOverHighWater", message, observed_generation=generation
    )


# The OutputUnread reason that stops the stage for good: a Warning Event is posted for it.
OUTPUT_NEVER_TRIMMED = "NoConsumerGroup"


def output_unread_condition(
    output: str | None, unread: bool, retention: str | None, generation: int | None = None
) -> Condition:
    """True while no consumer group reads the stage's output stream, whose entries then never finish."""
    if output is None:
        message = "a final stage: results are not forwarded"
        return new_condition(ConditionType.OUTPUT_UNREAD, False, "NoOutput", message, observed_generation=generation)
    if not unread:
        message = f"a consumer group reads {output}: it is trimmed as that group acknowledges"
        return new_condition(
            ConditionType.OUTPUT_UNREAD, False, "ReadByConsumerGroup", message, observed_generation=generation
        )
    if retention is not None:
        message = f"no consumer group reads {output}: the workers keep it to output.retention {retention}"
        return new_condition(
            ConditionType.OUTPUT_UNREAD, True, "RetentionApplies", message, observed_generation=generation
        )
    message = (
        f"no consumer group reads {output}, so nothing ever trims it: the stage stops reading at "
        "OUTPUT_HIGH_WATER and stays stopped; set spec.output.retention (e.g. maxlen:100000 or age:7d) for a "
        "stream read with XREAD, or point spec.output at a stage"
    )
    return new_condition(
        ConditionType.OUTPUT_UNREAD, True, OUTPUT_NEVER_TRIMMED, message, observed_generation=generation
    )


def redis_risk_condition(risk: RedisRisk, generation: int | None = None) -> Condition:
    """True when the server's settings can lose acknowledged data; Unknown when it refused to tell."""
    if not risk.checked:
        return new_condition(
            ConditionType.REDIS_RISK, None, "CannotCheck", risk.describe(), observed_generation=generation
        )
    if risk.problems:
        return new_condition(
            ConditionType.REDIS_RISK, True, "DataLossPossible", risk.describe(), observed_generation=generation
        )
    return new_condition(ConditionType.REDIS_RISK, False, "Durable", risk.describe(), observed_generation=generation)


def queue_figures_condition(disagreements: Sequence[tuple[str, str]], generation: int | None = None) -> Condition:
    """True while Redis's counters (XINFO's lag, XPENDING's oldest entry) disagree with the stream's ids, as after
    XDEL or XTRIM (tools/queue_stats.py): the reason is the first disagreement's, the message says each."""
    if not disagreements:
        message = "XINFO's lag and XPENDING's oldest entry agree with the stream's entry ids"
        return new_condition(
            ConditionType.QUEUE_FIGURES_DISAGREE, False, "FiguresAgree", message, observed_generation=generation
        )
    message = "; ".join(message for _, message in disagreements)
    reason = disagreements[0][0]
    return new_condition(ConditionType.QUEUE_FIGURES_DISAGREE, True, reason, message, observed_generation=generation)
