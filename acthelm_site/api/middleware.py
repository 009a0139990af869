"""Errors the API does not answer itself — a method the path does not take (405), a path it does
not have (404), a failure outside an endpoint (500), a request Django refuses before the API sees
it — come back in the API's JSON error shape, `{"code", "message", "field"}`, not as Django's
HTML page. Only under /api/, and only for an answer that is not JSON already."""

import json
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase

from core.exceptions import ErrorCode

PREFIX = "/api/"
# The code of each status Django may answer with before the API sees the request; another status
# keeps the generic code.
CODES = {
    code.http_status: code
    for code in (
        ErrorCode.INVALID_INPUT,
        ErrorCode.PERMISSION_DENIED,
        ErrorCode.NOT_FOUND,
        ErrorCode.METHOD_NOT_ALLOWED,
        ErrorCode.BODY_TOO_LARGE,
        ErrorCode.SERVER_ERROR,
    )
}
MESSAGES = {
    400: "the request could not be read",
    403: "the request was refused",
    404: "there is no such API path",
    413: "the request body is too large",
    500: "the server failed on this request; it is logged",
}


class ApiJsonErrors:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = self.get_response(request)
        if (
            not request.path.startswith(PREFIX)
            or response.status_code < 400
            or response.get("Content-Type", "").startswith("application/json")
        ):
            return response
        status = response.status_code
        message = MESSAGES.get(status, "the request failed")
        if status == 405:
            allowed = response.get("Allow", "")
            message = f"{request.method} is not allowed here; allowed: {allowed or 'none'}"
        body = {"code": CODES.get(status, ErrorCode.ERROR), "message": message, "field": None}
        out = HttpResponse(json.dumps(body), status=status, content_type="application/json")
        for header in ("Allow", "WWW-Authenticate"):
            if header in response:
                out[header] = response[header]
        return out
