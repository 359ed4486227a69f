"""Resident worker groups: a sweep's runs trained in Ray Train workers kept alive across runs.

``pool`` (the sweep's ``GroupPool`` actor and each group's ``GroupHost``) and ``serve`` (a
group's train function)."""

__all__: list[str] = []
