% rebase('base')
<h1>Provider batches</h1>
<form method="get" action="{{prefix}}/batches" class="filters">
  <label>State
    <select name="state">
      <option value="">any</option>
% for name in states:
      <option value="{{name}}" {{'selected' if filters.get('state') == name else ''}}>{{name}}</option>
% end
    </select>
  </label>
  <button type="submit">Filter</button>
  <a href="{{prefix}}/batches">Clear</a>
</form>
% if error:
<p class="alert" role="alert">{{error}}</p>
% end
<h2>Waiting for a batch</h2>
<div class="scroll">
<table class="waiting">
  <thead><tr><th>provider/model</th><th>jobs</th><th>oldest waited</th></tr></thead>
  <tbody>
% for group in waiting:
  <tr><td>{{group['group']}}</td><td>{{group['jobs']}}</td><td>{{duration(group['oldest'], now)}}</td></tr>
% end
% if not waiting:
  <tr><td colspan="3" class="muted">No job is waiting for a batch.</td></tr>
% end
  </tbody>
</table>
</div>
<h2>Batches</h2>
<div class="scroll">
<table class="batches">
  <thead><tr>
    <th>batch</th><th>provider/model</th><th>state</th><th>provider status</th><th>jobs</th>
    <th>answered</th><th>failed</th><th>age</th><th>cost</th><th>created</th>
  </tr></thead>
  <tbody>
% for row in batches:
%   batch = row['batch']
  <tr>
    <td><a href="{{batch_url(batch.id)}}"><code>{{batch.id}}</code></a></td>
    <td>{{batch.provider}}/{{batch.model}}</td>
    <td><span class="badge b-{{batch.state}}">{{batch.state}}</span></td>
    <td>{{batch.provider_status or '—'}}</td>
    <td>{{batch.job_count}}</td>
    <td>{{batch.succeeded_count}}</td>
    <td>{{batch.failed_count}}</td>
    <td>{{duration(batch.created_at, batch.ended_at or now)}}</td>
    <td>{{row['cost']}}</td>
    <td>{{when(batch.created_at)}}</td>
  </tr>
% end
% if not batches:
  <tr><td colspan="10" class="muted">No batch matches.</td></tr>
% end
  </tbody>
</table>
</div>
<p class="pages">
% if filters.get('cursor'):
  <a href="{{prefix}}/batches?{{urlencode(page_query)}}">« First page</a>
% end
% if next_cursor:
  <a href="{{prefix}}/batches?{{urlencode(dict(page_query, cursor=next_cursor))}}" rel="next">Next page »</a>
% end
</p>
