<section class="cards">
% for state in states:
  <a class="card s-{{state}}" href="{{prefix}}/jobs?{{urlencode({'lifecycleStatus': state})}}">
    <span class="n">{{totals[state]}}</span>
    <span class="l">{{state}}{{'' if state in ('queued', 'running') else ' (24 h)'}}</span>
  </a>
% end
  <div class="card">
    <span class="n">{{outbox['pending']}}</span><span class="l">outbox pending</span>
  </div>
  <div class="card {{'bad' if outbox['dead'] else ''}}">
    <span class="n">{{outbox['dead']}}</span><span class="l">outbox dead</span>
  </div>
</section>

<h2>Queues</h2>
<div class="scroll">
<table>
  <thead><tr><th>queue</th><th>waiting</th><th>in flight</th>
% for state in states:
    <th>{{state}}</th>
% end
  </tr></thead>
  <tbody>
% for q in queues:
  <tr>
    <td><a href="{{prefix}}/jobs?{{urlencode({'queueName': q['name']})}}">{{q['name']}}</a></td>
    <td>{{'unavailable' if q['depth'] is None else q['depth']}}</td>
    <td>{{'unavailable' if q['in_flight'] is None else q['in_flight']}}</td>
%   for state in states:
    <td><a href="{{prefix}}/jobs?{{urlencode({'queueName': q['name'], 'lifecycleStatus': state})}}">{{q['counts'][state]}}</a></td>
%   end
  </tr>
% end
  </tbody>
</table>
</div>
<p class="muted">Queued and running: every such job. Finished: jobs created in the last 24 hours.</p>

<h2>Busiest users</h2>
% if not busiest:
<p class="muted">No user has a job waiting or running.</p>
% else:
<div class="scroll">
<table id="busiest-users">
  <thead><tr><th>user</th><th>waiting</th><th>running</th><th>oldest waiting</th>
    <th>wait p50</th><th>wait p95</th><th>started ({{wait_window_min}} min)</th></tr></thead>
  <tbody>
% for u in busiest:
  <tr>
    <td><a href="{{prefix}}/jobs?{{urlencode({'userId': u.user_id})}}">{{u.user_id}}</a></td>
    <td><a href="{{prefix}}/jobs?{{urlencode({'userId': u.user_id, 'lifecycleStatus': 'queued'})}}">{{u.waiting}}</a></td>
    <td><a href="{{prefix}}/jobs?{{urlencode({'userId': u.user_id, 'lifecycleStatus': 'running'})}}">{{u.running}}</a></td>
    <td>{{seconds(u.oldest_waiting_s) if u.waiting else '–'}}</td>
    <td>{{seconds(u.wait_p50_s)}}</td>
    <td>{{seconds(u.wait_p95_s)}}</td>
    <td>{{u.waits}}</td>
  </tr>
% end
  </tbody>
</table>
</div>
<p class="muted">The users with the most jobs waiting (then running). Wait: from create to running, of their jobs started in the last {{wait_window_min}} minutes.</p>
% end

<h2>Throughput, last hour</h2>
<p>{{finished_last_hour}} jobs finished; failure rate {{failure_rate}}.</p>
<figure class="chart">
<svg viewBox="0 0 {{chart['width']}} {{chart['height'] + 18}}" role="img"
     aria-label="Jobs finished per minute over the last hour, and the failure rate">
  <line class="axis" x1="0" y1="{{chart['height']}}" x2="{{chart['width']}}" y2="{{chart['height']}}"></line>
% for bar in chart['bars']:
  <g><title>{{bar.title}}</title>
    <rect class="hit" x="{{bar.x}}" y="0" width="{{bar.width}}" height="{{chart['height']}}"></rect>
%   for css, part in (('ok', bar.succeeded), ('ko', bar.failed), ('off', bar.cancelled)):
%     if part[1] > 0:
    <rect class="{{css}}" x="{{bar.x}}" y="{{part[0]}}" width="{{bar.width}}" height="{{part[1]}}"></rect>
%     end
%   end
  </g>
% end
% if len(chart['rate']) > 1:
  <polyline class="rate" points="{{chart['rate_points']}}"></polyline>
% end
% for x, y in chart['rate']:
  <circle class="rate-dot" cx="{{x}}" cy="{{y}}" r="2.5"></circle>
% end
  <text x="2" y="12">{{chart['peak']}}/min</text>
  <text x="2" y="{{chart['height'] + 14}}">{{when(chart['start'])[11:16]}}</text>
  <text x="{{chart['width'] - 2}}" y="{{chart['height'] + 14}}" class="end">now</text>
</svg>
<figcaption>
  <span class="key ok"></span> succeeded <span class="key ko"></span> failed
  <span class="key off"></span> cancelled <span class="key rate"></span> failure rate (0–100 %)
</figcaption>
</figure>

<h2>Provider cooldowns</h2>
% if not cooldowns:
<p class="muted">No provider/model is cooling down: every route entry takes calls.</p>
% else:
<div class="scroll">
<table id="cooldowns">
  <thead><tr><th>provider/model</th><th>skipped for</th></tr></thead>
  <tbody>
% for entry, left in cooldowns:
  <tr><td><code>{{entry}}</code></td><td>{{'%.1f s' % left}}</td></tr>
% end
  </tbody>
</table>
</div>
<p class="muted">Every worker skips these until their cooldown ends (AIJOB_COOLDOWN_*).</p>
% end

<h2>Workers</h2>
% if not workers:
<p class="muted">No worker has a live heartbeat.</p>
% else:
<div class="scroll">
<table>
  <thead><tr><th>worker</th><th>heartbeat</th><th>running</th></tr></thead>
  <tbody>
% for w in workers:
  <tr>
    <td><code>{{w['id']}}</code></td>
    <td>{{'%.1f s left' % (w['ttl_ms'] / 1000.0)}}</td>
    <td>
%   if not w['jobs']:
      <span class="muted">idle</span>
%   end
%   for job in w['jobs']:
      <a href="{{job_url(job.id)}}">{{job.job_type}} {{job.id[:8]}}…</a> {{job.progress}} %<br>
%   end
    </td>
  </tr>
% end
  </tbody>
</table>
</div>
% end
% if deferred:
<h3>Deferred</h3>
<p class="muted">Handed back by a rate limit or a budget: waiting without a worker until their wake time, no retry spent.</p>
<ul>
% for job in deferred:
  <li><a href="{{job_url(job.id)}}">{{job.job_type}} {{job.id}}</a> until {{when(job.lock_until)}}</li>
% end
</ul>
% end
% if lost:
<h3>Running without a live heartbeat</h3>
<p class="muted">Their worker stopped heartbeating; the reaper takes them over once their lock expires.</p>
<ul>
% for job in lost:
  <li><a href="{{job_url(job.id)}}">{{job.job_type}} {{job.id}}</a> held by <code>{{job.locked_by}}</code> until {{when(job.lock_until)}}</li>
% end
</ul>
% end
