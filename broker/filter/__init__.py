"""Message filters evaluated on the broker: RocketMQ's SQL92 property selector (``compile_sql92``)."""

from broker.filter.sql92 import EvaluationError, SqlFilter, compile_sql92
from broker.filter.sql92_lexer import SqlParseError

__all__ = ["EvaluationError", "SqlFilter", "SqlParseError", "compile_sql92"]
