// sections.js: the conversation's sections, and which of them a long conversation keeps in
// the page (render.js draws into them).

// A conversation of this many sections (turns, and parts of long turns) or items (messages,
// calls, results, notes) or more keeps in the page only the sections within NEAR_PX of the
// view; a shorter one keeps them all.
const KEEP_ALL_BELOW = 40;
const KEEP_ALL_ITEMS = 250;
const NEAR_PX = 2500;

/**
 * The conversation's sections: one before the first turn, then one per turn, and one per
 * part of a long turn (render.js's PART_ITEMS items, then the turn goes on in the next). A long
 * conversation keeps in the page only the sections near the view: one far above or below
 * it is emptied into a fragment kept aside, its height kept, and filled again as it comes
 * near (an IntersectionObserver says when). The last section (the current turn's) always
 * stays, so what a live turn draws is drawn in the page.
 */
export class Sections {
  constructor(box) {
    this.box = box;
    this.observer = new IntersectionObserver((entries) => this.seen(entries), { root: box, rootMargin: `${NEAR_PX}px 0px` });
    this.aside = new Map(); // section → its children, while it is out of the page
    this.all = [];
  }

  reset() {
    this.observer.disconnect();
    this.aside.clear();
    this.all = [];
    this.items = 0;
    this.long = false;
    this.box.replaceChildren();
  }

  /** Opens a section after the others; the one before it may now be put aside. */
  open(kind, attrs = {}) {
    const section = document.createElement('section');
    section.className = kind;
    for (const [name, value] of Object.entries(attrs)) if (value != null) section.setAttribute(name, value);
    this.box.append(section);
    this.all.push(section);
    if (this.all.length > 1) this.observer.observe(this.all.at(-2));
    this.weigh(0);
    return section;
  }

  /** Counts the items drawn: the conversation is long from KEEP_ALL_BELOW sections or KEEP_ALL_ITEMS items. */
  weigh(items) {
    this.items += items;
    if (this.long || (this.all.length < KEEP_ALL_BELOW && this.items < KEEP_ALL_ITEMS)) return;
    this.long = true;
    // Long enough now: every section is looked at again (observing anew reports where each is).
    for (const earlier of this.all.slice(0, -1)) {
      this.observer.unobserve(earlier);
      this.observer.observe(earlier);
    }
  }

  /**
   * Puts aside every section but the last (a long log drawn out of sight, about to show at
   * its end): what shows first is the last section alone, not every section near it at the
   * height guessed for sections never laid out; the observer fills those near it again.
   * (Those never laid out are put aside at that guess, 240 px, until they come near: the
   * scroll bar is only about right for a long log just opened.)
   */
  asideAllButLast() {
    const earlier = this.all.slice(0, -1);
    const heights = earlier.map((section) => section.getBoundingClientRect().height); // (one layout, then writes)
    earlier.forEach((section, i) => this.putAside(section, heights[i]));
    // Observed anew (what it queued meanwhile is dropped): it reports where each is, and
    // fills those near the view again.
    this.observer.takeRecords();
    for (const section of earlier) {
      this.observer.unobserve(section);
      this.observer.observe(section);
    }
  }

  seen(entries) {
    for (const entry of entries) {
      if (entry.isIntersecting) this.restore(entry.target);
      else if (this.long && entry.target !== this.all.at(-1)) this.putAside(entry.target, entry.boundingClientRect.height);
    }
  }

  putAside(section, height) {
    if (this.aside.has(section)) return;
    const kept = document.createDocumentFragment();
    kept.append(...section.childNodes);
    section.style.height = `${height}px`;
    section.dataset.aside = 'true';
    this.aside.set(section, kept);
  }

  restore(section) {
    const kept = this.aside.get(section);
    if (!kept) return;
    this.aside.delete(section);
    section.append(kept);
    section.style.height = '';
    delete section.dataset.aside;
  }
}
