package service

import (
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// The event lookup and replay on the admin address (see AdminHandler):
//
//	GET  /events/{id}                JSON EventInfo; 404 for an unknown ID
//	POST /events/{id}/replay         Replay; JSON ReplayResult
//	POST /partners/{partner}/replay  ReplayRange, form fields from and to
//	                                 (RFC 3339, or the form's 2006-01-02T15:04[:05], UTC)
//	GET  /ui/event?id=...            the page's search: redirects to /ui/events/{id}
//	GET  /ui/events/{id}             the event's page: attempts, replays, a Replay button
//	GET  /ui/partners/{partner}      the partner's latest events, a range replay form
//
// A replay posted by the pages' forms (field ui=1) redirects back to the
// page (303) instead of answering JSON.

func (s *Service) routeEvents(mux *http.ServeMux) {
	mux.HandleFunc("GET /events/{id}", s.handleEventJSON)
	mux.HandleFunc("POST /events/{id}/replay", s.handleReplayEvent)
	mux.HandleFunc("POST /partners/{partner}/replay", s.handleReplayRange)
	mux.HandleFunc("GET /ui/event", s.handleEventSearch)
	mux.HandleFunc("GET /ui/events/{id}", s.handleEventPage)
	mux.HandleFunc("GET /ui/partners/{partner}", s.handlePartnerPage)
}

// eventStatus is the HTTP status of a lookup's or replay's error.
func eventStatus(err error) int {
	switch {
	case errors.Is(err, ErrUnknownEvent), errors.Is(err, ErrUnknownPartner):
		return http.StatusNotFound
	case errors.Is(err, ErrBadRange), errors.Is(err, ErrReplayTooMany), errors.Is(err, ErrReplayNothing):
		return http.StatusBadRequest
	case errors.Is(err, ErrClosed):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

func (s *Service) handleEventJSON(w http.ResponseWriter, r *http.Request) {
	ev, err := s.Event(r.Context(), r.PathValue("id"))
	if err != nil {
		writeJSON(w, eventStatus(err), errorBody{err.Error()})
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, ev)
}

func (s *Service) handleReplayEvent(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	res, err := s.Replay(r.Context(), id)
	if r.FormValue("ui") == "1" && err == nil {
		http.Redirect(w, r, "/ui/events/"+url.PathEscape(id)+"?"+replayDone(res), http.StatusSeeOther)
		return
	}
	if err != nil {
		writeJSON(w, eventStatus(err), errorBody{err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// parseFormTime reads an RFC 3339 time or a datetime-local form value (UTC).
func parseFormTime(name, v string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04"} {
		if t, err := time.ParseInLocation(layout, v, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%w: %s %q: need RFC 3339 or 2006-01-02T15:04[:05] (UTC)", ErrBadRange, name, v)
}

func (s *Service) handleReplayRange(w http.ResponseWriter, r *http.Request) {
	partner := r.PathValue("partner")
	from, err := parseFormTime("from", r.FormValue("from"))
	var to time.Time
	if err == nil {
		to, err = parseFormTime("to", r.FormValue("to"))
	}
	var res ReplayResult
	if err == nil {
		res, err = s.ReplayRange(r.Context(), partner, from, to)
	}
	if r.FormValue("ui") == "1" && err == nil {
		http.Redirect(w, r, "/ui/partners/"+url.PathEscape(partner)+"?"+replayDone(res), http.StatusSeeOther)
		return
	}
	if err != nil {
		writeJSON(w, eventStatus(err), errorBody{err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Service) handleEventSearch(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimSpace(r.FormValue("id"))
	if id == "" {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, "/ui/events/"+url.PathEscape(id), http.StatusSeeOther)
}

var eventPages = template.Must(template.New("pages").Funcs(template.FuncMap{
	"ts": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000") },
	"ms": func(d time.Duration) string { return d.Round(100 * time.Microsecond).String() },
}).Parse(`{{define "head"}}<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{.}}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em; }
table { border-collapse: collapse; }
th, td { padding: .25em .7em; border-bottom: 1px solid #ddd; text-align: left; vertical-align: top; }
td.body, td.err { max-width: 36em; overflow-wrap: anywhere; font-family: monospace; font-size: .9em; }
td.err { color: #a33; }
.state-parked, .state-skipped { color: #a33; font-weight: bold; }
.state-delivered { color: #2a6; }
form { display: inline; }
</style>
</head>
<body>
<p><a href="/">← partners</a>
<form method="get" action="/ui/event" id="search"><input name="id" id="search-id" size="40" placeholder="event ID"> <button type="submit" id="search-go">Find</button></form></p>
{{end}}
{{define "event"}}{{template "head" (printf "event %s" .E.ID)}}
<h1>Event <code id="event-id">{{.E.ID}}</code></h1>
{{with .Flash}}<p><strong id="flash">{{.}}</strong></p>{{end}}
<table id="event">
<tr><th>partner</th><td><a href="/ui/partners/{{.E.Partner}}">{{.E.Partner}}</a></td></tr>
<tr><th>type</th><td>{{.E.Type}}</td></tr>
<tr><th>accepted</th><td>{{ts .E.Created}} UTC</td></tr>
<tr><th>state</th><td id="state" class="state-{{.E.State}}">{{.E.State}}</td></tr>
<tr><th>delivered at</th><td id="delivered-at">{{with .E.DeliveredAt}}{{ts .}} UTC{{else}}-{{end}}</td></tr>
{{with .E.LastError}}<tr><th>last error</th><td class="err">{{.}}</td></tr>{{end}}
</table>
<p><form method="post" action="/events/{{.E.ID}}/replay"><input type="hidden" name="ui" value="1">
<button type="submit" id="replay">Replay</button></form>
sends the event again, with the same Webhook-Id, after the partner's undelivered events (a parked event is retried instead).</p>
<h2>Attempts</h2>
{{with .E.AttemptsOmitted}}<p>{{.}} older attempts not shown.</p>{{end}}
<table id="attempts">
<tr><th>#</th><th>at (UTC)</th><th>took</th><th>outcome</th><th>status</th><th>error</th><th>response body (first bytes)</th><th>relay</th><th>replay</th></tr>
{{range $i, $a := .E.Attempts}}
<tr class="attempt {{$a.Outcome}}"><td>{{$i}}</td><td>{{ts $a.At}}</td><td>{{ms $a.Duration}}</td><td class="outcome">{{$a.Outcome}}</td><td>{{if $a.Status}}{{$a.Status}}{{end}}</td>
<td class="err">{{$a.Error}}</td><td class="body">{{$a.Body}}</td><td>{{$a.Relay}}</td><td>{{if $a.Replay}}yes{{end}}</td></tr>
{{else}}<tr><td colspan="9">no attempt recorded</td></tr>
{{end}}
</table>
{{if .E.Replays}}
<h2>Replays</h2>
<table id="replays"><tr><th>requested (UTC)</th><th>state</th><th>replay ID</th></tr>
{{range .E.Replays}}<tr><td>{{ts .RequestedAt}}</td><td class="state-{{.State}}">{{.State}}</td><td><code>{{.ID}}</code></td></tr>{{end}}
</table>
{{end}}
<p><a href="/events/{{.E.ID}}">JSON</a></p>
</body></html>
{{end}}
{{define "partner"}}{{template "head" (printf "partner %s" .Partner)}}
<h1>Partner {{.Partner}}: latest events</h1>
{{with .Flash}}<p><strong id="flash">{{.}}</strong></p>{{end}}
<p>backlog {{.Status.Backlog}}; {{if .Status.Parked}}<strong class="state-parked">parked</strong>{{else}}active{{end}}; destination {{.Status.Destination}}</p>
<table id="latest">
<tr><th>accepted (UTC)</th><th>event</th><th>type</th><th>state</th><th>attempts</th><th>replays</th></tr>
{{range .Events}}
<tr data-event="{{.ID}}"><td>{{ts .Created}}</td><td><a href="/ui/events/{{.ID}}">{{.ID}}</a></td><td>{{.Type}}</td><td class="state state-{{.State}}">{{.State}}</td><td>{{.Attempts}}</td><td>{{.Replays}}</td></tr>
{{else}}<tr><td colspan="6">no event</td></tr>
{{end}}
</table>
<h2>Replay a time range</h2>
<p>Sends again every event of {{.Partner}} accepted in [from, to) (UTC), in their order, after the partner's undelivered events; at most {{.Max}}.</p>
<form method="post" action="/partners/{{.Partner}}/replay" id="replay-range"><input type="hidden" name="ui" value="1">
from <input type="datetime-local" step="1" name="from" id="from"> to <input type="datetime-local" step="1" name="to" id="to">
<button type="submit" id="replay-range-go">Replay</button></form>
</body></html>
{{end}}`))

// replayDone encodes a replay's counts for the page it redirects to.
func replayDone(res ReplayResult) string {
	return fmt.Sprintf("done=replay&q=%d&r=%d&p=%d&x=%d", len(res.Requeued), len(res.Recovered), len(res.Pending), len(res.Expired))
}

// replayFlash is what a page says after a replay: text of its own made from
// the counts (no query text is echoed, see flash).
func replayFlash(r *http.Request) string {
	q := r.URL.Query()
	if q.Get("done") != "replay" {
		return ""
	}
	var parts []string
	for _, c := range []struct{ key, what string }{
		{"q", "sent again (queued behind the partner's undelivered events)"},
		{"r", "parked, retried"},
		{"p", "not delivered yet, left as they are"},
		{"x", "past the history's retention, not sent"},
	} {
		n, err := strconv.Atoi(q.Get(c.key))
		if err != nil || n < 0 {
			return ""
		}
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, c.what))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "replay: " + strings.Join(parts, "; ")
}

func (s *Service) handleEventPage(w http.ResponseWriter, r *http.Request) {
	ev, err := s.Event(r.Context(), r.PathValue("id"))
	if err != nil {
		http.Error(w, err.Error(), eventStatus(err))
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := eventPages.ExecuteTemplate(w, "event", struct {
		E     EventInfo
		Flash string
	}{ev, replayFlash(r)}); err != nil {
		s.log.Error("event page", "err", err)
	}
}

func (s *Service) handlePartnerPage(w http.ResponseWriter, r *http.Request) {
	partner := r.PathValue("partner")
	evs, err := s.LatestEvents(r.Context(), partner, 50)
	if err != nil {
		http.Error(w, err.Error(), eventStatus(err))
		return
	}
	var st PartnerStatus
	all, err := s.Status(r.Context())
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	for _, p := range all {
		if p.Partner == partner {
			st = p
		}
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := eventPages.ExecuteTemplate(w, "partner", struct {
		Partner string
		Status  PartnerStatus
		Events  []EventSummary
		Flash   string
		Max     int
	}{partner, st, evs, replayFlash(r), MaxReplay}); err != nil {
		s.log.Error("partner page", "err", err)
	}
}
