package service

import (
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"
)

var operatorPage = template.Must(template.New("page").Funcs(template.FuncMap{
	"age": func(d time.Duration) string {
		if d <= 0 {
			return "-"
		}
		return d.Round(time.Millisecond).String()
	},
}).Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>webhook delivery: partners</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em; }
table { border-collapse: collapse; }
th, td { padding: .25em .7em; border-bottom: 1px solid #ddd; text-align: right; }
th:first-child, td:first-child, td.err { text-align: left; }
tr.parked { background: #fff1e6; }
td.err { max-width: 32em; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; color: #a33; }
form { display: inline; }
</style>
</head>
<body>
<h1>Partners</h1>
<p>{{.Total}} undelivered events; {{len .Parked}} parked partners; {{.Now.Format "15:04:05"}} UTC.
{{with .Flash}}<strong id="flash">{{.}}</strong>{{end}}</p>
<form method="get" action="/ui/event" id="search">Did they get it? <input name="id" id="search-id" size="40" placeholder="event ID"> <button type="submit" id="search-go">Find event</button></form>
{{if .Parked}}
<h2>Parked</h2>
<p>A parked partner's head event failed its attempts; its later events wait, none is dropped.
Resume retries the head with a fresh attempt budget; Skip gives up the head event shown (it is not delivered) and goes on: if the head changed since this page was loaded, nothing is skipped.</p>
<table id="parked">
<tr><th>partner</th><th>head event</th><th>backlog</th><th>oldest</th><th>last error</th><th></th></tr>
{{range .Parked}}
<tr class="parked" data-partner="{{.Partner}}" data-head="{{.Head}}">
<td>{{.Partner}}</td><td class="head"><a href="/ui/events/{{.HeadEvent}}">{{.HeadEvent}}</a>{{if ne .Head .HeadEvent}} (replay {{.Head}}){{end}}</td><td>{{.Backlog}}</td><td>{{age .OldestAge}}</td><td class="err" title="{{.LastError}}">{{.LastError}}</td>
<td>
<form method="post" action="/partners/{{.Partner}}/resume"><button type="submit" id="resume-{{.Partner}}">Resume</button></form>
<form method="post" action="/partners/{{.Partner}}/skip"><input type="hidden" name="event" value="{{.Head}}"><button type="submit" id="skip-{{.Partner}}">Skip</button></form>
</td>
</tr>
{{end}}
</table>
{{end}}
<h2>All partners, by backlog and age</h2>
<table id="partners">
<tr><th>partner</th><th>state</th><th>backlog</th><th>trend (5 min)</th><th>slope</th><th>oldest undelivered</th><th>delivered</th><th>failed attempts</th><th>parks</th><th>skipped</th><th>breaker</th><th>destination</th></tr>
{{range .Partners}}{{$t := index $.Trends .Partner}}
<tr data-partner="{{.Partner}}" class="{{if .Parked}}parked{{end}}">
<td><a href="/ui/partners/{{.Partner}}">{{.Partner}}</a></td><td class="state">{{if .Parked}}parked{{else}}active{{end}}</td><td class="backlog">{{.Backlog}}</td><td>{{$t.Spark}}</td><td class="slope">{{$t.Slope}}</td><td>{{age .OldestAge}}</td>
<td class="delivered">{{.Delivered}}</td><td>{{.Failed}}</td><td>{{.Parks}}</td><td>{{.Skipped}}</td><td>{{.Breaker}}</td><td>{{.Destination}}</td>
</tr>
{{end}}
</table>
<p><a href="/metrics">/metrics</a></p>
</body>
</html>
`))

type pageData struct {
	Now      time.Time
	Total    int
	Partners []PartnerStatus
	Parked   []PartnerStatus
	Flash    string
	Trends   map[string]trendView
}

// trendView is a partner's backlog trend on the page.
type trendView struct {
	Spark template.HTML // an inline SVG chart of the last 5 minutes' samples and the backlog now
	Slope string        // its slope, events/s with a sign
}

func (s *Service) handleOperatorPage(w http.ResponseWriter, r *http.Request) {
	now := s.now()
	all, err := s.Status(r.Context())
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	d := pageData{Now: now.UTC(), Partners: all, Flash: s.flash(r.URL.Query().Get("done")), Trends: map[string]trendView{}}
	for _, p := range all {
		v, span := s.trend.slope(p.Partner)
		tv := trendView{Spark: s.trend.spark(p.Partner, now, p.Backlog), Slope: "-"}
		if span > 0 {
			tv.Slope = fmt.Sprintf("%+.2f/s", v)
		}
		d.Trends[p.Partner] = tv
		d.Total += p.Backlog
		if p.Parked {
			d.Parked = append(d.Parked, p)
		}
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := operatorPage.Execute(w, d); err != nil {
		s.log.Error("operator page", "err", err)
	}
}

// handleOperatorAction is POST /partners/{partner}/{action}, action resume or
// skip; it redirects back to the page (303). A skip needs the form field
// event, the head the operator saw (PartnerStatus.Head; the page's Skip
// button sends it): without it 400, and 409 with the current head when the
// head changed (nothing skipped) or the partner is not parked.
func (s *Service) handleOperatorAction(w http.ResponseWriter, r *http.Request) {
	partner, action := r.PathValue("partner"), r.PathValue("action")
	if !s.known(partner) {
		http.Error(w, fmt.Sprintf("unknown partner %q", partner), http.StatusNotFound)
		return
	}
	var err error
	switch action {
	case "resume":
		err = s.Resume(r.Context(), partner)
	case "skip":
		head := r.FormValue("event")
		if head == "" {
			http.Error(w, fmt.Sprintf("skip of partner %q needs the form field event: the ID of the parked head event you decided to give up (the operator page's Skip button sends it; GET / shows it)", partner), http.StatusBadRequest)
			return
		}
		err = s.Skip(r.Context(), partner, head)
	default:
		http.Error(w, fmt.Sprintf("unknown action %q (resume or skip)", action), http.StatusNotFound)
		return
	}
	switch {
	case errors.Is(err, ErrHeadChanged):
		http.Error(w, err.Error()+"\nReload the operator page and decide again.", http.StatusConflict)
		return
	case errors.Is(err, ErrNotParked):
		http.Error(w, fmt.Sprintf("partner %q is not parked", partner), http.StatusConflict)
		return
	case errors.Is(err, ErrUnknownEvent):
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	case errors.Is(err, ErrClosed):
		http.Error(w, "the service is shutting down", http.StatusServiceUnavailable)
		return
	case err != nil:
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	http.Redirect(w, r, "/?done="+url.QueryEscape(actionDone[action]+" "+partner), http.StatusSeeOther)
}

// actionDone is what the page says after an action, followed by the partner.
var actionDone = map[string]string{"resume": "resumed", "skip": "skipped the head event of"}

// flash returns the page's confirmation for done (the redirect's query), or
// "" unless it is one the actions produce for a configured partner: any
// link could otherwise make the operator page state anything ("?done=all
// events delivered"), in its own voice.
func (s *Service) flash(done string) string {
	for _, past := range actionDone {
		if p, ok := strings.CutPrefix(done, past+" "); ok && s.known(p) {
			return done
		}
	}
	return ""
}
