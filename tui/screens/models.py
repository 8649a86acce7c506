"""The models screen: the pair in use, the catalog's pairs and models with what is
installed and what fits, switching pairs, and downloading one (the download is the
app's, so it goes on when this screen closes)."""

from __future__ import annotations

from typing import ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Label, ProgressBar, Static

from localspec.models.hardware import fmt_size
from localspec.models.inventory import PairStatus
from tui.listing import Listing, gather
from tui.messages import Download, Listed
from tui.pair import PairSpec

PAIR_COLUMNS = ("PAIR", "TARGET", "DRAFT", "SIZE", "INSTALLED", "FITS")
MODEL_COLUMNS = ("MODEL", "ROLE", "QUANT", "SIZE", "INSTALLED", "FITS")


class ModelsScreen(ModalScreen[PairSpec | None]):
    """Dismisses with the PairSpec to switch to, or None."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss(None)", "Close"),
        Binding("enter", "use", "Use pair", priority=True),
        Binding("d", "download", "Download pair"),
        Binding("p", "planned", "Planner's pair"),
    ]

    download: reactive[Download | None] = reactive(None)
    """The app's download, mirrored here for the progress bar."""

    def __init__(self, current: PairSpec) -> None:
        super().__init__()
        self.current = current
        self.listing: Listing | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="models-dialog", classes="dialog"):
            yield Static("Models", classes="dialog-title")
            yield Static("", id="models-machine")
            yield Static(f"In use: {self.current.label}", id="models-current", markup=False)
            yield Label("Pairs", classes="models-heading")
            yield DataTable(id="models-pairs", cursor_type="row", zebra_stripes=True)
            with Horizontal(id="models-download"):
                yield Label("", id="models-download-line")
                yield ProgressBar(id="models-progress", show_eta=False)
            yield Label("Catalog", classes="models-heading")
            yield DataTable(id="models-catalog", cursor_type="row", zebra_stripes=True)
            yield Static("", id="models-plan", classes="dialog-hint")
        yield Footer(compact=True)  # this screen's keys, not the chat's under it

    def on_mount(self) -> None:
        self.query_one("#models-pairs", DataTable).add_columns(*PAIR_COLUMNS)
        self.query_one("#models-catalog", DataTable).add_columns(*MODEL_COLUMNS)
        self.query_one("#models-pairs").loading = True
        self.watch(self.app, "download", self._mirror_download)
        self.refresh_listing()

    @work(thread=True, exclusive=True, exit_on_error=False, group="listing")
    def refresh_listing(self) -> None:
        try:
            listing = gather()
        except Exception as e:
            self.app.call_from_thread(
                self.app.notify, f"Could not read the catalog: {e}", severity="error"
            )
            listing = Listing("unknown machine")
        self.post_message(Listed(listing))

    def on_listed(self, message: Listed) -> None:
        self.listing = listing = message.listing
        self.query_one("#models-machine", Static).update(f"This machine: {listing.machine}")
        self.query_one("#models-plan", Static).update(
            "Enter uses the highlighted pair · d downloads it · p the planner's pair"
            + (f"\nPlanner: {listing.plan_note}" if listing.plan_note else "")
        )
        pairs = self.query_one("#models-pairs", DataTable)
        pairs.loading = False
        pairs.clear()
        pairs.focus()  # it could not take the focus while loading
        for p in listing.pairs:
            installed = "yes" if p.installed else f"{fmt_size(p.missing)} to get"
            pairs.add_row(p.id, p.target, p.draft, fmt_size(p.size), installed, p.fits, key=p.id)
        models = self.query_one("#models-catalog", DataTable)
        models.clear()
        for m in listing.models:
            models.add_row(
                m.id, m.role, m.quant, fmt_size(m.size), "yes" if m.installed else "-", m.fits
            )

    def _mirror_download(self, download: Download | None) -> None:
        previous, self.download = self.download, download
        if (
            download is not None
            and download.finished
            and (previous is None or not previous.finished)
        ):
            self.refresh_listing()  # now installed

    def watch_download(self, download: Download | None) -> None:
        self.set_class(download is not None and not download.finished, "-downloading")
        if download is None:
            return
        bar = self.query_one(ProgressBar)
        bar.update(total=max(download.total, 1), progress=min(download.done, download.total))
        line = download.error or download.line
        self.query_one("#models-download-line", Label).update(
            f"{download.pair_id}: {line}" if line else download.pair_id
        )

    def highlighted_pair(self) -> PairStatus | None:
        if self.listing is None or not self.listing.pairs:
            return None
        table = self.query_one("#models-pairs", DataTable)
        index = table.cursor_row
        return self.listing.pairs[index] if 0 <= index < len(self.listing.pairs) else None

    def action_use(self) -> None:
        pair = self.highlighted_pair()
        if pair is None:
            return
        if not pair.installed:
            self.notify(f"{pair.id} is not installed: press d to download it.", severity="warning")
            return
        self.dismiss(pair.spec)

    def action_download(self) -> None:
        pair = self.highlighted_pair()
        if pair is None:
            return
        if pair.installed:
            self.notify(f"{pair.id} is installed already.")
            return
        self.app.start_download(pair)  # type: ignore[attr-defined]

    def action_planned(self) -> None:
        if self.listing is None or self.listing.planned is None:
            self.notify(
                self.listing.plan_note if self.listing else "Still reading the catalog.",
                severity="warning",
            )
            return
        self.dismiss(self.listing.planned)

    @on(DataTable.RowSelected, "#models-pairs")
    def _selected(self) -> None:
        self.action_use()
