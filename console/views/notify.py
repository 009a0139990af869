"""The console's notifications page: targets and their state, recent deliveries and failures."""

from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from console.http import AuthenticatedHttpRequest
from console.links import notification_links
from console.shared import console_view
from tasks.notify.selectors import deliveries_page
from tasks.permissions import VIEW_NOTIFICATION


@require_GET
@console_view(VIEW_NOTIFICATION)
def notifications(request: AuthenticatedHttpRequest) -> HttpResponse:
    page = deliveries_page(status=request.GET.get("status", ""))
    links = notification_links(page["rows"], request.user)
    rows = [(row, links[row.pk]) for row in page["rows"]]
    return render(request, "console/notifications.html", {**page, "rows": rows})
