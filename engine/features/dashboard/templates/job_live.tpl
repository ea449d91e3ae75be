<section class="status">
  <span class="badge big s-{{job.lifecycle_status}}" id="status">{{job.lifecycle_status}}</span>
  <progress id="progress" max="100" value="{{job.progress}}">{{job.progress}} %</progress>
  <span id="progress-text">{{job.progress}} %</span>
</section>

<section class="actions">
% if can_cancel:
  <form method="post" action="{{job_url(job.id)}}/cancel" data-confirm="Cancel job {{job.id}}?">
    <input type="hidden" name="csrf" value="{{csrf}}">
    <button type="submit" class="danger">Cancel job</button>
  </form>
% end
% if can_retry:
  <form method="post" action="{{job_url(job.id)}}/retry" data-confirm="Run job {{job.id}} again as a new job?">
    <input type="hidden" name="csrf" value="{{csrf}}">
    <button type="submit">Retry as a new job</button>
  </form>
% end
</section>

<div class="grid">
<section>
<h2>Job</h2>
<dl class="facts">
  <dt>type</dt><dd>{{job.job_type}}</dd>
  <dt>queue</dt><dd>{{job.queue_name}} (priority {{job.priority}})</dd>
  <dt>user</dt><dd><a href="{{prefix}}/jobs?{{urlencode({'userId': job.user_id})}}">{{job.user_id}}</a></dd>
  <dt>target</dt><dd>{{job.target_type}}:{{job.target_id}}</dd>
  <dt>credential</dt><dd>{{job.credential_mode}}</dd>
% if answered_by:
  <dt>model</dt><dd id="answered-by">{{answered_by}}</dd>
% end
% if job.idempotency_key:
  <dt>idempotency key</dt><dd>{{job.idempotency_key}}</dd>
% end
% if job.retry_of_job_id:
  <dt>retry of</dt><dd><a href="{{job_url(job.retry_of_job_id)}}"><code>{{job.retry_of_job_id}}</code></a></dd>
% end
% for retry in retries:
  <dt>retried as</dt><dd><a href="{{job_url(retry.id)}}"><code>{{retry.id}}</code></a> ({{retry.lifecycle_status}})</dd>
% end
</dl>
</section>
<section>
<h2>Timing and attempts</h2>
<dl class="facts">
  <dt>created</dt><dd>{{when(job.created_at)}}</dd>
  <dt>started</dt><dd>{{when(job.started_at) or '–'}}</dd>
  <dt>finished</dt><dd>{{when(job.finished_at) or '–'}}</dd>
  <dt>waited</dt><dd>{{duration(job.created_at, job.started_at) or '–'}}</dd>
  <dt>ran</dt><dd>{{duration(job.started_at, job.finished_at) or '–'}}</dd>
  <dt>attempt</dt><dd>{{job.attempt_no}}</dd>
  <dt>retries</dt><dd>{{job.retry_count}} of {{job.max_retry_count}}</dd>
% if job.locked_by and not terminal:
  <dt>lock</dt><dd><code>{{job.locked_by}}</code> until {{when(job.lock_until)}}</dd>
% end
% if job.cancel_requested_at:
  <dt>cancel requested</dt><dd>{{when(job.cancel_requested_at)}}</dd>
% end
</dl>
</section>
</div>

% if job.error_code:
<section class="failure">
<h2>Error</h2>
<dl class="facts">
  <dt>code</dt><dd><code>{{job.error_code}}</code></dd>
  <dt>public message</dt><dd>{{job.public_error_message or ''}}</dd>
  <dt>internal message</dt><dd><pre>{{job.internal_error_message or ''}}</pre></dd>
</dl>
</section>
% end

<section>
<h2>History</h2>
<ol class="timeline">
% for event in events:
  <li class="k-{{event['kind']}}">
    <time datetime="{{event['at']}}" title="{{event['at']}}">{{event['at'][11:23]}}</time>
    <span class="after">{{event['after']}}</span>
    <strong>{{event['kind']}}</strong>
%   if event['attemptNo']:
    <span class="muted">attempt {{event['attemptNo']}}</span>
%   end
%   for key, value in sorted(event['detail'].items()):
    <span class="detail">{{key}}: {{value}}</span>
%   end
  </li>
% end
% if not events:
  <li class="muted">No history recorded.</li>
% end
</ol>
</section>

<section>
<h2>Usage and cost</h2>
% if usage:
<div class="scroll">
<table>
  <thead><tr><th>attempt</th><th>provider</th><th>model</th><th>prompt tokens</th>
    <th>completion tokens</th><th>cost</th><th>latency</th><th>error</th></tr></thead>
  <tbody>
%   for call in usage:
  <tr><td>{{call.attempt_no}}</td><td>{{call.provider}}</td><td>{{call.model}}</td>
    <td>{{call.prompt_tokens}}</td><td>{{call.completion_tokens}}</td><td>{{call.cost}}</td>
    <td>{{call.latency_ms}} ms</td><td>{{call.error_code or ''}}</td></tr>
%   end
  <tr class="total"><td colspan="3">total ({{usage_total['calls']}})</td>
    <td>{{usage_total['prompt_tokens']}}</td><td>{{usage_total['completion_tokens']}}</td>
    <td>{{usage_total['cost']}}</td><td colspan="2"></td></tr>
  </tbody>
</table>
</div>
% else:
<p class="muted">No provider call recorded.</p>
% end
</section>

<section>
<h2>Artifacts</h2>
% for artifact in artifacts:
<h3>{{artifact['artifactType']}} <code>{{artifact['artifactId']}}</code></h3>
%   if artifact['content'] is not None:
<pre>{{pretty(artifact['content'])}}</pre>
%   end
% end
% if not artifacts:
<p class="muted">None.</p>
% end
</section>

