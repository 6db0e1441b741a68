"""The one error of `ackmq ctl`: rabbitmqctl's text and exit code."""

from __future__ import annotations


class CtlError(Exception):
    def __init__(self, text: str, code: int) -> None:
        super().__init__(text)
        self.text, self.code = text, code
