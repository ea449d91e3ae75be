% rebase('base')
% b = batch['batch']
<h1>Batch <code class="id">{{b.id}}</code></h1>
<dl class="facts">
  <dt>provider/model</dt><dd>{{b.provider}}/{{b.model}}</dd>
  <dt>state</dt><dd><span class="badge b-{{b.state}}" id="state">{{b.state}}</span></dd>
  <dt>provider status</dt><dd>{{b.provider_status or '—'}}</dd>
  <dt>provider batch</dt><dd><code>{{b.provider_batch_id or '—'}}</code></dd>
  <dt>input file</dt><dd><code>{{b.input_file_id or '—'}}</code></dd>
  <dt>output / error file</dt><dd><code>{{b.output_file_id or '—'}}</code> / <code>{{b.error_file_id or '—'}}</code></dd>
  <dt>jobs</dt><dd>{{b.job_count}} ({{b.succeeded_count}} answered, {{b.failed_count}} failed)</dd>
  <dt>cost</dt><dd id="cost">{{batch['cost']}}</dd>
  <dt>age</dt><dd>{{duration(b.created_at, b.ended_at or now)}}</dd>
  <dt>created</dt><dd>{{when(b.created_at)}}</dd>
  <dt>submitted</dt><dd>{{when(b.submitted_at) or '—'}}</dd>
  <dt>ended</dt><dd>{{when(b.ended_at) or '—'}}</dd>
  <dt>polls</dt><dd>{{b.poll_count}}{{', next at ' + when(b.next_poll_at) if b.next_poll_at else ''}}</dd>
</dl>
<h2>Jobs</h2>
<div class="scroll">
<table class="jobs">
  <thead><tr><th>job</th><th>attempt</th><th>line</th><th>error</th><th>job status</th></tr></thead>
  <tbody>
% for row in jobs:
%   item = row['item']
  <tr>
    <td><a href="{{job_url(item.job_id)}}"><code>{{item.job_id}}</code></a></td>
    <td>{{item.attempt_no}}</td>
    <td>{{item.state}}</td>
    <td>{{item.error_code or ''}}</td>
    <td>
%   if row['status']:
      <span class="badge s-{{row['status']}}">{{row['status']}}</span>
%   else:
      <span class="muted">purged</span>
%   end
    </td>
  </tr>
% end
% if not jobs:
  <tr><td colspan="5" class="muted">No job in this batch.</td></tr>
% end
  </tbody>
</table>
</div>
% if not shown_all:
<p class="muted">The first {{len(jobs)}} jobs of the batch.</p>
% end
<p><a href="{{prefix}}/batches">« All batches</a></p>
