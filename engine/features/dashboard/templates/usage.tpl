% rebase('base')
<h1>Usage</h1>
<form method="get" action="{{prefix}}/usage" class="filters">
  <label>Since (UTC) <input type="datetime-local" name="since" value="{{input_value(since)}}"></label>
  <label>until <input type="datetime-local" name="until" value="{{input_value(until)}}"></label>
  <button type="submit">Show</button>
</form>
% if error:
<p class="alert" role="alert">{{error}}</p>
% end
% for panel in panels:
{{!panel}}\\
% end
<p class="muted">Provider calls from {{when(since)}} to {{when(until)}}.</p>
% for heading, key, rows in (('By user', 'userId', by_user), ('By job type', 'jobType', by_type)):
<h2>{{heading}}</h2>
<div class="scroll">
<table>
  <thead><tr><th>{{key}}</th><th>calls</th><th>prompt tokens</th><th>completion tokens</th>
    <th>cost</th><th>errors</th></tr></thead>
  <tbody>
%   for row in rows:
  <tr><td>{{row[key]}}</td><td>{{row['calls']}}</td><td>{{row['promptTokens']}}</td>
    <td>{{row['completionTokens']}}</td><td>{{row['cost']}}</td><td>{{row['errors']}}</td></tr>
%   end
%   if not rows:
  <tr><td colspan="6" class="muted">No calls.</td></tr>
%   end
  </tbody>
</table>
</div>
% end
