package e2e

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	cheetah "github.com/cheetahbroker/cheetah"
)

// stepTakeControl: a person presses Take control in the real popup on the
// leased tab; the broker refuses the application's navigate (held) and
// lets extract through; the badge says the person drives the tab; Give
// back, and navigate passes again.
func stepTakeControl(t *testing.T, e *env, s *story) {
	popup := s.popup
	button := fmt.Sprintf(`#workers tr[data-tab-id="%s"] button.hold`, s.tabID)
	label := func() string {
		got, err := chromedp.Run(popup, chromedp.Evaluate[string](
			fmt.Sprintf(`(document.querySelector('%s') || {}).textContent || ''`, button)))
		if err != nil {
			return ""
		}
		return got
	}
	eventually(t, 10*time.Second, "the popup offers Take control", func() bool { return label() == "Take control" })
	press(t, popup, button)
	eventually(t, 10*time.Second, "the popup offers Give back", func() bool { return label() == "Give back" })
	eventually(t, 10*time.Second, "the badge says the person drives the tab", func() bool {
		b, err := e.badge(s.tabID)
		return err == nil && b == "YOU"
	})
	var held *cheetah.HeldError
	eventually(t, 10*time.Second, "navigate refused held", func() bool {
		_, err := s.h.SendAndWait(e.ctx, cheetah.Command{Name: "navigate", Params: map[string]any{"url": e.pages.URL + "/article"}},
			cheetah.WithTimeout(20*time.Second))
		if err == nil {
			t.Fatal("navigate passed while the person held the tab")
		}
		return errors.As(err, &held) && held.Hold.State == cheetah.HoldActive
	})
	got := ok[extracted](e, s.h, "extract", map[string]any{"selector": "h1"})
	if got.Title == "" {
		t.Errorf("extract while held: %+v", got)
	}
	leases, err := e.mgr.TaskContexts(e.ctx, userID, taskID)
	if err != nil || len(leases) != 1 || leases[0].Held == nil || leases[0].Held.State != cheetah.HoldActive {
		t.Fatalf("the lease view shows no active hold: %+v %v", leases, err)
	}

	press(t, popup, button)
	eventually(t, 10*time.Second, "the popup offers Take control again", func() bool { return label() == "Take control" })
	eventually(t, 10*time.Second, "the badge is back to automation", func() bool {
		b, err := e.badge(s.tabID)
		return err == nil && b == "BOT"
	})
	nav := ok[where](e, s.h, "navigate", map[string]any{"url": e.pages.URL + "/form"})
	if nav.Title != "Form" {
		t.Fatalf("navigate after Give back: %+v", nav)
	}
}

// press clicks the element of selector in one step in the page: the popup
// redraws its rows every second, so a node found first and clicked after
// may be gone in between.
func press(t *testing.T, page context.Context, selector string) {
	t.Helper()
	eventually(t, 10*time.Second, "press "+selector, func() bool {
		clicked, err := chromedp.Run(page, chromedp.Evaluate[bool](
			fmt.Sprintf(`(() => { const b = document.querySelector(%q); if (!b || b.disabled) return false; b.click(); return true; })()`, selector)))
		return err == nil && clicked
	})
}
