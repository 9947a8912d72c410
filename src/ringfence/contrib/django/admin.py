"""Fences and dead jobs in the Django admin: read-only lists and pages, plus the two actions a person takes.

- Fences → *resolve*: an in-doubt step "happened" (with the provider's reference) or "did not happen";
  the same checks and write as ``ringfence fence resolve`` (needs the ``ringfence.resolve_fence`` permission).
- Outbox rows (``task.enqueue_in``) waiting for the relay: a read-only list.
- Dead jobs → *replay*: the same as ``ringfence dead replay ID...`` (needs ``ringfence.replay_failedjob``):
  from Redis, or from the failed_jobs table when Redis lost the job; the row is marked replayed.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.db.models import QuerySet
from django.http import HttpRequest

from ringfence.contrib.django import get_app
from ringfence.contrib.django.models import FailedJob, Fence, OutboxRow
from ringfence.errors import RingfenceError


class ReadOnly(admin.ModelAdmin):
    """ringfence's statements are the only writers of its tables: no add, change or delete here."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ResolveForm(ActionForm):
    reference = forms.CharField(required=False, label="provider's reference",
                                help_text="for “it happened”: the provider's id of the effect")


@admin.register(Fence)
class FenceAdmin(ReadOnly):
    list_display = ("subject", "step", "state", "epoch", "owner_job_id", "reference", "updated_at")
    list_filter = ("state", "step")
    search_fields = ("subject", "owner_job_id", "reference", "provider_key")
    action_form = ResolveForm
    actions = ("resolve_happened", "resolve_not_happened")

    def has_resolve_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("ringfence.resolve_fence"))

    @admin.action(description="Resolve in doubt: it happened (give the provider's reference)",
                  permissions=["resolve"])
    def resolve_happened(self, request: HttpRequest, queryset: QuerySet[Fence]) -> None:
        reference = request.POST.get("reference", "").strip() or None
        if queryset.count() != 1:
            self.message_user(request, "Select exactly one step: a reference belongs to one effect",
                              messages.ERROR)
            return
        if reference is None:
            self.message_user(request, "Not resolved: type the provider's reference (its id of the effect) in the "
                                       "box next to the action", messages.ERROR)
            return
        self._resolve(request, queryset, True, reference)

    @admin.action(description="Resolve in doubt: it did not happen (the replay calls the provider again)",
                  permissions=["resolve"])
    def resolve_not_happened(self, request: HttpRequest, queryset: QuerySet[Fence]) -> None:
        self._resolve(request, queryset, False, None)

    def _resolve(self, request: HttpRequest, queryset: QuerySet[Fence], happened: bool,
                 reference: str | None) -> None:
        from ringfence.cli.fence import resolve_step

        app = get_app()
        for fence in queryset:
            try:
                row = resolve_step(app, fence.subject, fence.step, happened, reference)
            except RingfenceError as exc:
                self.message_user(request, f"Step {fence} not resolved: {exc}", messages.ERROR)
                continue
            self.message_user(request, f"Step {fence}: now {row.state} (epoch {row.epoch}); replay its job "
                                       f"{fence.owner_job_id} under Dead jobs to finish it", messages.SUCCESS)


class Replayed(admin.SimpleListFilter):
    title = "replayed"
    parameter_name = "replayed"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("no", "not yet"), ("yes", "replayed")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() in ("no", "yes"):
            return queryset.filter(replayed_at__isnull=self.value() == "no")
        return queryset


@admin.register(FailedJob)
class FailedJobAdmin(ReadOnly):
    list_display = ("job_id", "task", "queue", "reason", "attempts", "short_error", "died_at", "replayed_at")
    list_filter = (Replayed, "reason", "queue", "task")
    search_fields = ("job_id", "task", "error")
    actions = ("replay",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[FailedJob]:
        """Only this app's namespace: another namespace's jobs are not this app's to replay."""
        return super().get_queryset(request).filter(namespace=get_app().namespace)

    @admin.display(description="error")
    def short_error(self, obj: FailedJob) -> str:
        return (obj.error or "")[:80]

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("ringfence.replay_failedjob"))

    @admin.action(description="Replay (same job id: fences still apply)", permissions=["replay"])
    def replay(self, request: HttpRequest, queryset: QuerySet[FailedJob]) -> None:
        from ringfence.cli.dead import replay_dead

        ids = sorted({job.job_id for job in queryset.filter(replayed_at__isnull=True)})
        skipped = queryset.exclude(replayed_at__isnull=True).count()
        if skipped:
            self.message_user(request, f"Skipped {skipped} row(s) already replayed", messages.WARNING)
        if not ids:
            return
        try:
            done = replay_dead(get_app(), tuple(ids))
        except RingfenceError as exc:
            self.message_user(request, f"Not replayed: {exc}", messages.ERROR)
            return
        note = f" ({done.restored} restored from the failed_jobs table)" if done.restored else ""
        self.message_user(request, f"Replayed {len(done.replayed)} job(s){note}", messages.SUCCESS)
        if done.malformed:
            self.message_user(request, f"Not replayed, malformed record(s): {' '.join(done.malformed[:20])}",
                              messages.ERROR)


@admin.register(OutboxRow)
class OutboxAdmin(ReadOnly):
    list_display = ("job_id", "task", "queue", "namespace", "created_at", "parked_at", "parked_reason")
    list_filter = ("queue", "task", "namespace", "parked_at")
    search_fields = ("job_id", "task")
