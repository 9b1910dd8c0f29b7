"""OpInfo entries for the 'linalg' op group."""

from tests.opinfo import OpInfo

OP_INFOS: list[OpInfo] = []
