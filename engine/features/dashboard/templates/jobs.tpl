% rebase('base')
<h1>Jobs</h1>
<form method="get" action="{{prefix}}/jobs" class="search">
  <label for="jobId">Job id</label>
  <input id="jobId" name="jobId" placeholder="0192…" autocomplete="off">
  <button type="submit">Open</button>
</form>
<form method="get" action="{{prefix}}/jobs" class="filters">
  <label>Type
    <select name="jobType">
      <option value="">any</option>
% for name in job_types:
      <option value="{{name}}" {{'selected' if filters.get('jobType') == name else ''}}>{{name}}</option>
% end
    </select>
  </label>
  <label>Status
    <select name="lifecycleStatus">
      <option value="">any</option>
% for name in statuses:
      <option value="{{name}}" {{'selected' if filters.get('lifecycleStatus') == name else ''}}>{{name}}</option>
% end
    </select>
  </label>
  <label>Queue
    <select name="queueName">
      <option value="">any</option>
% for name in queue_names:
      <option value="{{name}}" {{'selected' if filters.get('queueName') == name else ''}}>{{name}}</option>
% end
    </select>
  </label>
  <label>User <input name="userId" value="{{filters.get('userId', '')}}" autocomplete="off"></label>
  <label>Created from (UTC)
    <input type="datetime-local" name="createdFrom" value="{{filters.get('createdFrom', '')}}">
  </label>
  <label>to
    <input type="datetime-local" name="createdTo" value="{{filters.get('createdTo', '')}}">
  </label>
  <button type="submit">Filter</button>
  <a href="{{prefix}}/jobs">Clear</a>
</form>
% if error:
<p class="alert" role="alert">{{error}}</p>
% end
<div {{!'data-live="%d"' % refresh_ms if not filters.get('cursor') else ''}}>
% include('jobs_live')
</div>
