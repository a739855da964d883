"""The API's request bodies: JSON that is also data the studio can store (workers.definitions.data_problem).

json.loads accepts a lone surrogate ("\\ud800": not a character, so no database or encoder stores it) and nests as
deep as the interpreter's recursion limit (every recursive walk after it, ours or a library's, then fails). Both
are the client's mistake and answer 400, before anything else reads the body. What passes has its text's line
endings made "\n" (workers/definitions/newlines.py): a client on Windows sends "\r\n" as readily as a browser.
"""

import json

from ninja.errors import HttpError
from ninja.parser import Parser

from workers.definitions.canonical import MAX_DEPTH, data_problem
from workers.definitions.newlines import normalise_newlines


class StrictJSONParser(Parser):
    def parse_body(self, request):
        try:
            data = json.loads(request.body)
        except RecursionError:
            raise HttpError(400, f"The request body is nested deeper than {MAX_DEPTH} levels.") from None
        problem = data_problem(data, where="body")
        if problem:
            raise HttpError(400, f"The request body is refused: {problem}.")
        return normalise_newlines(data)
