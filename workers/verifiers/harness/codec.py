# The plain-data codec both sides of the harness share (runner.py and candidate.py are each sent with this
# file prepended: they run as standalone programs inside the sandbox).
def encode(value):
    """Plain data to JSON with tags for what JSON lacks; anything else is refused."""
    if value is None or isinstance(value, (bool, str)) or type(value) in (int, float):
        return value if not (type(value) is float and value != value) else {"$float": "nan"}
    if type(value) is list:
        return [encode(v) for v in value]
    if type(value) is tuple:
        return {"$tuple": [encode(v) for v in value]}
    if type(value) in (set, frozenset):
        return {"$set": [encode(v) for v in value]}
    if type(value) is bytes:
        return {"$bytes": value.hex()}
    if type(value) is dict:
        return {"$dict": [[encode(k), encode(v)] for k, v in value.items()]}
    raise TypeError(f"a {type(value).__name__} cannot cross the sandbox boundary (plain data only)")


def decode(value):
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, dict):
        (tag, inner), = value.items()
        if tag == "$tuple":
            return tuple(decode(v) for v in inner)
        if tag == "$set":
            return {decode(v) for v in inner}
        if tag == "$bytes":
            return bytes.fromhex(inner)
        if tag == "$dict":
            return {decode(k): decode(v) for k, v in inner}
        if tag == "$float":
            return float(inner)
        raise ValueError(f"unknown tag {tag}")
    return value
