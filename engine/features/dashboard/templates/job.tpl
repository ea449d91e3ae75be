% rebase('base')
<h1>Job <code class="id">{{job.id}}</code></h1>
<div {{!'' if terminal else 'data-live="%d"' % job_refresh_ms}}>
% include('job_live')
</div>
<section>
<h2>Input</h2>
% if input is None:
<p class="muted">The input snapshot has expired and was purged.</p>
% else:
<pre id="input">{{input}}</pre>
% end
</section>

<section>
<h2>Retry failed jobs of this type</h2>
<form method="post" action="{{prefix}}/retry-failed" class="bulk"
      data-confirm="Retry every failed {{job.job_type}} job since the time given?">
  <input type="hidden" name="csrf" value="{{csrf}}">
  <input type="hidden" name="jobType" value="{{job.job_type}}">
  <label>Failed since (UTC) <input type="datetime-local" name="since" value="{{since_default}}" required></label>
  <button type="submit">Retry all failed {{job.job_type}} jobs</button>
</form>
<p class="muted">Each failed job not retried yet becomes a new job; the old ones stay as they are.</p>
</section>
