"""Slack's interactivity requests: one endpoint, no session and no CSRF token (Slack signs the
request instead; `console.slack` checks it before anything else)."""

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from console.slack import handle_interaction


@csrf_exempt
@require_POST
def interactivity(request: HttpRequest) -> JsonResponse:
    answer = handle_interaction(
        body=request.body,
        timestamp=request.headers.get("X-Slack-Request-Timestamp", ""),
        signature=request.headers.get("X-Slack-Signature", ""),
    )
    return JsonResponse(answer.as_json(), status=answer.status)
